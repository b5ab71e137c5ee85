// The console's script (placeholder until the console lands).
