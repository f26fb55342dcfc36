"""Views: the text a person reads (status, lists, sweep tables, plans, profiles, submit
lines) and the live console of `--wait`, from the data the runner returns."""
