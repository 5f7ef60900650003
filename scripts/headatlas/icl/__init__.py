"""Function-vector heads (Todd et al. 2024): ICL tasks, exact and checked-estimate patching, tables, figures."""
