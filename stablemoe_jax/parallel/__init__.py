"""Device meshes and the placement of batches and state across devices and hosts."""
