"""kvaudit's benchmarks: each `bench_*.py` module measures a figure beside its baseline."""
