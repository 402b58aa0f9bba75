"""Reading FX graphs: which operator a node calls, its int arguments, its static shapes (torch-lazy)."""
