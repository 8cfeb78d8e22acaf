"""Named SQL queries over the kvaudit views (installed as `kvaudit.queries`).

The `.sql` files beside this one are the queries; this file only makes the folder
an importable package so that the installed copies can be found (see
`kvaudit.analyse.named_queries`).
"""
