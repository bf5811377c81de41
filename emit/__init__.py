"""Code generation: a target turns a scheduled model into a module, a runtime runs it
(emit.protocol; after loopy's split of its targets from execution).

isl_ast          the schedule as an ISL AST, translated into cgen loops; the loops to tile
c_statements     a statement's operation nodes as C (StatementBody)
c_family         what the C and CUDA targets share: context struct, statement functions
c_target         the C target (OpenMP)
cuda_statements  statement bodies whose tile operations a block's threads share
cuda_arena       the block's shared-memory arena holding those tiles
cuda_host        the Python host driver launching the kernels
cuda_target      the CUDA target
runtime_c        the ctypes runtime; runtime_cuda: the PyCUDA and emulator runtimes
measured         a choice among ways to run a call, made by timing calls (threads, schedule_choice)
threads          the OpenMP thread count of each C call
schedule_choice  the C target's choice between the auto schedule and the original order
targets          the target names `ft.compile` takes -> (Target, Runtime)
"""
