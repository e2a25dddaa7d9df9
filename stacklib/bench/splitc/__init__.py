"""Split-C benchmark programs (paper 000 §6, paper 003 §5) and the SPMD runner."""
