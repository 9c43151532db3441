"""Deploying a compiled plan without Python: export bundles written (bundle.py) and read back and
checked (bundle_read.py), the MQL5 include for MetaTrader 5 (mql5.py), and ONNX for inference
anywhere (onnx.py). Above the compiler, below the Model that calls them."""
