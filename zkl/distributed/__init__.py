"""The trainer across ranks: who this process is (`ranks`), FSDP2 (`fsdp`), starting the
ranks (`launch`) and watching them (`watchdog`)."""
