"""`python -m experiments.table1`: Table 1 of the GLR paper: copy, associative recall, multi-hop recall (docs/papers.md; `--help` for the options)."""

from .runner import main

if __name__ == "__main__":
    main("table1", "Table 1 of the GLR paper: copy, associative recall, multi-hop recall")
