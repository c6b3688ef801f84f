"""Worker processes: everything that touches TensorFlow lives in this package."""
