"""Tests of zkl/lab/."""
