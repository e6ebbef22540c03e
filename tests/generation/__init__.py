"""Tests of zkl/generation/."""
