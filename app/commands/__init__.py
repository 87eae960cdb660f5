"""One module per group of CLI subcommands; app.cli registers them."""
