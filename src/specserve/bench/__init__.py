"""Benchmarks and their reports.

    runner.py       refactor scenarios x speculation modes x peers on the same weights
    load.py         `bench --concurrency`: many requests at once, in-process and through the server
    peers.py        llama-cpp-python and transformers generate() on the same weights
    replay.py       what the prediction drafter would accept, without a model
    report_html.py  the token-source HTML report
    samples/        the scenario files
"""
