"""Polyhedral model of an ETDG over ISL, dependence analysis, distance vectors and reuse."""
