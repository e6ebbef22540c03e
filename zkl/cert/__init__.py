"""The certificate: `python -m zkl.cert` certifies beds bitwise (`zkl.cert.certificate`)."""
