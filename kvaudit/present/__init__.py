"""Presenting: rows, findings and reports for people (Rich, HTML) and metrics for Prometheus.

May import: the analysis stage, `kvaudit.backends`, Rich, plotly, prometheus_client.
"""
