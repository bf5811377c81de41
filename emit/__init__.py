"""Code generation: ISL AST -> cgen; targets (C, CUDA) produce source, runtimes run it."""
