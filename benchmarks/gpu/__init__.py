"""Sections of the prepared GPU check (benchmarks/gpu_check.sh): each writes one JSON file as it goes."""
