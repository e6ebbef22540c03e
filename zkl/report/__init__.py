"""`python -m zkl.report`: compare runs of a sweep (or any run directories) in one page.

`runs` finds and reads the runs, `axes` what tells them apart, `naming` the arms and their
one name, `style` each arm's colour, dash and marker, `summary` the opening (what was
compared, the winners), `tables` and `treatments` the comparison tables (HTML and Markdown),
`contents` every table in page order and `report.md`, `figures` the plots, `page` the static
HTML, `wandb_report` the W&B Report.
"""
