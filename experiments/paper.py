"""The paper's own measurements that our tables and plots print beside theirs."""

# the paper's Table 7 (A100, GB of DRAM traffic): FractalTensor and the materialising systems
PAPER_DRAM = {"bigbird": {"FractalTensor": 12.36, "Triton": 28.21, "PyTorch": 47.49, "TVM": 108.9},
              "flash_attention": {"FractalTensor": 3.99, "Triton": 4.01, "FlashAttention-2": 4.13,
                                  "CUTLASS": 3.98}}
