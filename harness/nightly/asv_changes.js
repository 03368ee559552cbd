/*
  Optimus-bench: the nightly's change points on asv's graphs (written by harness/asv_marks.py).

  Why a flot plugin: asv draws every graph with flot 0.8.3 (pinned by asv's index.html), and
  flot's plugin API (hooks processOptions and draw) is public and stable, unlike the closures of
  asv's graphdisplay.js. For the benchmark shown on the main graph, each change point of
  window.OPTIMUS_CHANGES becomes a vertical line at its first commit, a band back to the last
  commit at the old level, and a label (commit, cell, size) as a div.optimus-change, which a
  headless browser's DOM dump can count. Only the main graph and the commit (x) axis are marked,
  and only changes whose series is selected (asv's p-<param> URL parameters).
*/
(function ($) {
    var data = window.OPTIMUS_CHANGES || {};

    function page() {
        return $.asv.parse_hash_string(window.location.hash);
    }

    function x_of(hash) {
        var rev = $.asv.get_revision(hash);
        if (rev === null) {
            return null;
        }
        var scale = page().params['x-axis-scale'];
        if (scale && scale[0] === 'date') {
            return $.asv.main_json.revision_to_date[rev];
        }
        return parseInt(rev, 10);
    }

    function marks_for(plot) {
        if (plot.getPlaceholder().attr('id') !== 'main-graph' || !$.asv || !$.asv.main_json) {
            return [];
        }
        var info = page(), xaxis = info.params['x-axis'];
        if (xaxis && xaxis[0] !== 'commit') {
            return [];  // a parameter on the x axis: no commits to mark
        }
        var out = [];
        $.each(data[info.location.join('/')] || [], function (i, c) {
            var hidden = false;  // its series deselected (asv keeps the selection in p-<param>)
            $.each(c.params || {}, function (name, value) {
                var shown = info.params['p-' + name];
                hidden = hidden || (shown !== undefined && $.inArray(value, shown) === -1);
            });
            if (hidden) {
                return;
            }
            var x = x_of(c.commit), x0 = x_of(c.before);
            if (x !== null) {
                out.push({change: c, x: x, x0: x0});
            }
        });
        return out;
    }

    function init(plot) {
        plot.hooks.processOptions.push(function (plot, options) {
            $.each(marks_for(plot), function (i, m) {
                var colour = m.change.regression ? '#d00' : '#080';
                options.grid.markings.push({color: colour, lineWidth: 2, xaxis: {from: m.x, to: m.x}});
                if (m.x0 !== null) {
                    options.grid.markings.push({color: m.change.regression ? 'rgba(220,0,0,0.12)'
                                                : 'rgba(0,136,0,0.12)', xaxis: {from: m.x0, to: m.x}});
                }
            });
        });
        plot.hooks.draw.push(function (plot, ctx) {
            var holder = plot.getPlaceholder();
            holder.find('div.optimus-change').remove();
            var axis = plot.getAxes().xaxis;
            $.each(marks_for(plot), function (i, m) {
                if (m.x < axis.min || m.x > axis.max) {
                    return;
                }
                var p = plot.pointOffset({x: m.x, y: plot.getAxes().yaxis.max});
                var label = $('<div class="optimus-change"></div>').text(
                    'change point ' + m.change.commit.slice(0, 10) + ': ' + m.change.cell + ' ' +
                    m.change.size + (m.change.alert ? ' (' + m.change.alert + ')' : ''));
                label.attr('title', 'commits ' + m.change.before.slice(0, 10) + '..' +
                           m.change.commit.slice(0, 10) + ', ' + m.change.metric);
                var side = p.left > holder.width() / 2  // the label on the side with room
                    ? {right: (holder.width() - p.left + 4) + 'px'} : {left: (p.left + 4) + 'px'};
                label.css(side);
                label.css({position: 'absolute', top: (p.top + 4 + 18 * i) + 'px',
                           color: m.change.regression ? '#d00' : '#080', background: 'rgba(255,255,255,0.85)',
                           'font-size': 'smaller', 'white-space': 'nowrap', padding: '0 0.25em'});
                holder.append(label);
            });
        });
    }

    $.plot.plugins.push({init: init, options: {}, name: 'optimus-changes', version: '1'});
})(jQuery);
