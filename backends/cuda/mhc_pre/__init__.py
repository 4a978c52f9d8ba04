"""mhc_pre with a one-read forward on thread-block clusters (mhc_pre.cu) and the Triton backward."""
