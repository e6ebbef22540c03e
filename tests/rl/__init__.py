"""Tests of zkl/rl/."""
