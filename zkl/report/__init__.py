"""`python -m zkl.report`: compare runs of a sweep (or any run directories) in one page.

`runs` finds and reads the runs, `tables` builds the comparison tables (HTML and Markdown),
`page` draws the plots and writes the static HTML, `wandb_report` builds the W&B Report.
"""
