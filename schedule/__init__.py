"""Schedule: ETDG coarsening and access reordering (FractalTensor §5.1, §5.2)."""
