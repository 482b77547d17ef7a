"""cel-numpy: capability enhancement localization in pure NumPy."""
