"""The discovery layer: provider packages found through entry points, the
extension builds they ask for and the build cache."""
