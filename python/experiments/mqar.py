"""`python -m experiments.mqar`: MQAR of the log-linear paper: 64 key–value pairs, model width 32 (docs/papers.md; `--help` for the options)."""

from .runner import main

if __name__ == "__main__":
    main("mqar", "MQAR of the log-linear paper: 64 key–value pairs, model width 32")
