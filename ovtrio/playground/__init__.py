"""The browser playground served at `/`: plain HTML, CSS and JavaScript modules in
static/, shipped in the wheel, with no build step and nothing fetched from elsewhere."""
