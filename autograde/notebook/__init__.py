"""What the notebooks call besides the checks: `runtime`, which every notebook uses (the machine,
the data, launches that fail loudly), and one module per part of the course with what its
notebooks run and the figures they draw: `lab` (00-09), `talk` (10-13), `launching` (14-16),
`scaling` (17-19), `inside` (20-23). `figure_style` holds what the parts' figures share."""
