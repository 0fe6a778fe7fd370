"""Bundled data files: prefill-time profiles and capacity profiles."""
