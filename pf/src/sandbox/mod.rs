//! OS sandboxes for agent processes: Landlock on Linux, Seatbelt profiles on macOS.
