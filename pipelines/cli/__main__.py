"""`python -m pipelines.cli`, as scripts/gpu_check.py runs it without the entry point."""

from pipelines.cli import main

main()
