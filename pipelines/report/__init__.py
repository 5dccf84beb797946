"""The comparison report: algorithms side by side, plots, and the regression check.

This package reads what the stages wrote and tells a person what it means: `document` writes
report.md and report.json; the tables are in `tables` and `validation`, the terminal's in
`console`, the plots in `plots`, the regression check in `regression` with its statistics in
`regression_stats` (the iteration) and `regression_components` (its parts, attributed by the
model). It may import the spec, modelling and training; the stages and the CLI import its
modules. Importing the package imports none of them, so a command that needs one table does not
load matplotlib and scipy.
"""
