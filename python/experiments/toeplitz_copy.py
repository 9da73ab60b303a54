"""`python -m experiments.toeplitz_copy`: The Toeplitz paper's copy claim: Toeplitz against attention and Mamba-2 (docs/papers.md; `--help` for the options)."""

from .runner import main

if __name__ == "__main__":
    main("toeplitz_copy", "The Toeplitz paper's copy claim: Toeplitz against attention and Mamba-2")
