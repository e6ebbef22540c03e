"""Tests of zkl/models/."""
