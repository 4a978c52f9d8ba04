"""Stock-torch backends: each operator written with torch ops as a user would, in the case dtype."""
