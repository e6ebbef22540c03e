"""Precision recipes: parameter dtypes and what a Linear layer does to its weight and input
(`recipes`)."""
