"""The application: what a user runs.

The command line, benches, verification, replay, speed figures, reports
and the cache listing. It wires core and backends together; nothing
imports it except ``runner.__main__``.
"""
