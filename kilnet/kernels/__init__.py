"""What ops are built from, and the launches that are not ops: the ``Op`` interface and the
records an op hands the compiler (``base``: Param, Use, Kernel, ``kernel``), products
(``gemm``) and their index expressions (``index``), the loss kernels (``losses``), the
optimizers (``optimizers``) and target networks' averages (``polyak``)."""
