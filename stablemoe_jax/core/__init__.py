"""The bottom layer: constants and error types that several layers share. It imports nothing of the package."""
