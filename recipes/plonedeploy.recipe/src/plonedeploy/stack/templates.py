"""Where the kit's templates are, and how they are rendered.

One copy of each template, in the project's folders (docs/reference/recipe.md#templates):
``templates/`` holds what the recipe and the Ansible roles share (the wsgi ini of each WSGI
server, ``<server>.ini.in`` and ``_common.ini.in``; ``varnish.vcl.j2``; supervisord's
``supervisord.conf.j2`` and ``program.conf.j2``; ``logrotate.conf.in``), ``haproxy/`` the
balancer's ``haproxy.cfg.j2``. From a checkout (the recipe is a develop egg) they are read
there; a wheel of plonedeploy.recipe carries copies made when it is built (setup.py's
``build_py``: package data ``plonedeploy/stack/templates/``, HAProxy's beside the others),
and those are read when they exist.
"""
import os

import jinja2

_HERE = os.path.dirname(os.path.abspath(__file__))
#: A wheel's copies (package data); absent in a checkout.
_PACKAGED = os.path.join(_HERE, "templates")
#: The checkout: recipes/plonedeploy.recipe/src/plonedeploy/stack/ is five levels below it.
_CHECKOUT = os.path.normpath(os.path.join(_HERE, *[os.pardir] * 5))

#: The directory of the shared templates: the default of the instance recipe's
#: ``templates-directory`` and of the varnish recipe's ``template`` (``varnish.vcl.j2`` in it).
TEMPLATES_DIRECTORY = _PACKAGED if os.path.isdir(_PACKAGED) else os.path.join(_CHECKOUT, "templates")
#: HAProxy's template, the default of the haproxy recipe's ``template`` (and of the Ansible
#: role's ``haproxy_template``, from the checkout).
HAPROXY_TEMPLATE = (os.path.join(_PACKAGED, "haproxy.cfg.j2") if os.path.isdir(_PACKAGED)
                    else os.path.join(_CHECKOUT, "haproxy", "haproxy.cfg.j2"))


def render_template(path, context, filters=None):
    """Render the Jinja2 template at ``path`` with ``context`` (a dict) and return the text.

    ``{% include %}`` resolves against the template's own directory. Undefined variables
    are errors (``jinja2.StrictUndefined``), so a typo in a template fails the build
    instead of writing an empty value into a config file. ``filters``: ``{name: function}``
    added to Jinja2's, for templates Ansible renders too (e.g. its ``quote``).
    """
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(os.path.dirname(os.path.abspath(path))),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters.update(filters or {})
    return env.get_template(os.path.basename(path)).render(**context)
