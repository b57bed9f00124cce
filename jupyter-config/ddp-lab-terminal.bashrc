# Start-up file of JupyterLab terminals in the DDP Lab's environment: `make setup` copies it into
# .venv/etc/jupyter/, and jupyter_server_config.py there starts `bash --rcfile <this file> -i`.
# First what a login shell reads (its /etc/profile resets PATH), then the environment's bin/ first.
[ -r /etc/profile ] && . /etc/profile
if [ -r ~/.bash_profile ]; then . ~/.bash_profile
elif [ -r ~/.bash_login ]; then . ~/.bash_login
elif [ -r ~/.profile ]; then . ~/.profile
elif [ -r ~/.bashrc ]; then . ~/.bashrc
fi
# this file is <env>/etc/jupyter/ddp-lab-terminal.bashrc
PATH="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../bin" && pwd):$PATH"
export PATH
