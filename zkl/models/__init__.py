"""Native model families (the list: `zkl.models.registry.FAMILIES`); `build.build_model`
builds one."""
