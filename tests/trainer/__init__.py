"""Tests of zkl/trainer/."""
