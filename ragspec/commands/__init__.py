"""One module per group of CLI subcommands; ragspec.cli registers them."""
