"""What the Snakemake report shows beside the figures: every TSV of a rule as a self-contained, sortable HTML
page (html). Rule scripts of every analysis call it; ``core`` does not."""
