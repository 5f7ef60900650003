"""headatlas: what every attention head of a pretrained transformer does."""

__version__ = "0.1.0"
