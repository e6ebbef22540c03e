"""Tests of zkl/report/."""
