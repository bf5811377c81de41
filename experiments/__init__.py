"""One script per paper table/figure; each has run(preset, out_dir) and runs alone with python -m."""
