"""Tests of zkl/cert/."""
