"""Tests of zkl/data/."""
