"""The fixed-shape decode step (step.py): the GPU's exact, captured-once step, proved on the CPU."""
