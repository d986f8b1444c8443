"""Views: the magic, the ipywidgets panel, plotly/SVG charts and the command line."""
