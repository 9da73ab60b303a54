"""`python -m experiments.mqar`: MQAR of the log-linear paper: Mamba-2, gated DeltaNet and their lifts (docs/papers.md; `--help` for the options)."""

from .runner import main

if __name__ == "__main__":
    main("mqar", "MQAR of the log-linear paper: Mamba-2, gated DeltaNet and their lifts")
