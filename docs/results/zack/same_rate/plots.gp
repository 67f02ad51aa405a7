# Drawn by slimkv eval; run `gnuplot plots.gp` in this folder to redraw.
set encoding utf8

reset
set terminal pngcairo size 1000,2880
set termoption noenhanced
set output "passkey.png"
set multiplot layout 9,2
set xlabel 'depth (%)'
set ylabel 'length (tokens)'
set cbrange [0:1]
set palette defined (0 '#b2182b', 0.5 '#f7f7f7', 1 '#2166ac')
$passkey1 << EOD
x 0 25 50 75 100
512 1.000000 1.000000 1.000000 1.000000 1.000000
1024 1.000000 1.000000 1.000000 1.000000 1.000000
1536 1.000000 1.000000 1.000000 1.000000 1.000000
2048 1.000000 1.000000 1.000000 1.000000 1.000000
EOD
set title "dense (question after)"
plot $passkey1 matrix rowheaders columnheaders using 1:2:3 with image notitle, $passkey1 matrix rowheaders columnheaders using 1:2:(sprintf('%.2f',$3)) with labels notitle
$passkey2 << EOD
x 0 25 50 75 100
512 1.000000 1.000000 1.000000 1.000000 1.000000
1024 1.000000 1.000000 1.000000 1.000000 1.000000
1536 1.000000 1.000000 1.000000 1.000000 1.000000
2048 1.000000 1.000000 1.000000 1.000000 1.000000
EOD
set title "dense (question before)"
plot $passkey2 matrix rowheaders columnheaders using 1:2:3 with image notitle, $passkey2 matrix rowheaders columnheaders using 1:2:(sprintf('%.2f',$3)) with labels notitle
$passkey3 << EOD
x 0 25 50 75 100
512 1.000000 1.000000 1.000000 1.000000 1.000000
1024 1.000000 1.000000 1.000000 1.000000 1.000000
1536 1.000000 1.000000 1.000000 1.000000 1.000000
2048 1.000000 1.000000 1.000000 1.000000 1.000000
EOD
set title "zack:r=0.01 (question after)"
plot $passkey3 matrix rowheaders columnheaders using 1:2:3 with image notitle, $passkey3 matrix rowheaders columnheaders using 1:2:(sprintf('%.2f',$3)) with labels notitle
$passkey4 << EOD
x 0 25 50 75 100
512 1.000000 1.000000 1.000000 1.000000 1.000000
1024 1.000000 1.000000 1.000000 1.000000 1.000000
1536 1.000000 1.000000 1.000000 1.000000 1.000000
2048 1.000000 1.000000 1.000000 1.000000 1.000000
EOD
set title "zack:r=0.01 (question before)"
plot $passkey4 matrix rowheaders columnheaders using 1:2:3 with image notitle, $passkey4 matrix rowheaders columnheaders using 1:2:(sprintf('%.2f',$3)) with labels notitle
$passkey5 << EOD
x 0 25 50 75 100
512 1.000000 1.000000 1.000000 1.000000 1.000000
1024 1.000000 1.000000 1.000000 1.000000 1.000000
1536 1.000000 1.000000 1.000000 1.000000 1.000000
2048 1.000000 1.000000 1.000000 1.000000 1.000000
EOD
set title "zack:r=0.02 (question after)"
plot $passkey5 matrix rowheaders columnheaders using 1:2:3 with image notitle, $passkey5 matrix rowheaders columnheaders using 1:2:(sprintf('%.2f',$3)) with labels notitle
$passkey6 << EOD
x 0 25 50 75 100
512 1.000000 1.000000 1.000000 1.000000 1.000000
1024 1.000000 1.000000 1.000000 1.000000 1.000000
1536 1.000000 1.000000 1.000000 1.000000 1.000000
2048 1.000000 1.000000 1.000000 1.000000 1.000000
EOD
set title "zack:r=0.02 (question before)"
plot $passkey6 matrix rowheaders columnheaders using 1:2:3 with image notitle, $passkey6 matrix rowheaders columnheaders using 1:2:(sprintf('%.2f',$3)) with labels notitle
$passkey7 << EOD
x 0 25 50 75 100
512 1.000000 1.000000 1.000000 1.000000 1.000000
1024 1.000000 1.000000 1.000000 1.000000 1.000000
1536 1.000000 1.000000 1.000000 1.000000 1.000000
2048 1.000000 1.000000 1.000000 1.000000 1.000000
EOD
set title "zack:r=0.05 (question after)"
plot $passkey7 matrix rowheaders columnheaders using 1:2:3 with image notitle, $passkey7 matrix rowheaders columnheaders using 1:2:(sprintf('%.2f',$3)) with labels notitle
$passkey8 << EOD
x 0 25 50 75 100
512 1.000000 1.000000 1.000000 1.000000 1.000000
1024 1.000000 1.000000 1.000000 1.000000 1.000000
1536 1.000000 1.000000 1.000000 1.000000 1.000000
2048 1.000000 1.000000 1.000000 1.000000 1.000000
EOD
set title "zack:r=0.05 (question before)"
plot $passkey8 matrix rowheaders columnheaders using 1:2:3 with image notitle, $passkey8 matrix rowheaders columnheaders using 1:2:(sprintf('%.2f',$3)) with labels notitle
$passkey9 << EOD
x 0 25 50 75 100
512 1.000000 1.000000 1.000000 1.000000 1.000000
1024 1.000000 1.000000 1.000000 1.000000 1.000000
1536 1.000000 1.000000 1.000000 1.000000 1.000000
2048 1.000000 1.000000 1.000000 1.000000 1.000000
EOD
set title "zack:r=0.1 (question after)"
plot $passkey9 matrix rowheaders columnheaders using 1:2:3 with image notitle, $passkey9 matrix rowheaders columnheaders using 1:2:(sprintf('%.2f',$3)) with labels notitle
$passkey10 << EOD
x 0 25 50 75 100
512 1.000000 1.000000 1.000000 1.000000 1.000000
1024 1.000000 1.000000 1.000000 1.000000 1.000000
1536 1.000000 1.000000 1.000000 1.000000 1.000000
2048 1.000000 1.000000 1.000000 1.000000 1.000000
EOD
set title "zack:r=0.1 (question before)"
plot $passkey10 matrix rowheaders columnheaders using 1:2:3 with image notitle, $passkey10 matrix rowheaders columnheaders using 1:2:(sprintf('%.2f',$3)) with labels notitle
$passkey11 << EOD
x 0 25 50 75 100
512 1.000000 1.000000 1.000000 1.000000 1.000000
1024 1.000000 1.000000 1.000000 1.000000 1.000000
1536 1.000000 1.000000 1.000000 1.000000 1.000000
2048 1.000000 1.000000 1.000000 1.000000 1.000000
EOD
set title "zack:r=0.2 (question after)"
plot $passkey11 matrix rowheaders columnheaders using 1:2:3 with image notitle, $passkey11 matrix rowheaders columnheaders using 1:2:(sprintf('%.2f',$3)) with labels notitle
$passkey12 << EOD
x 0 25 50 75 100
512 1.000000 1.000000 1.000000 1.000000 1.000000
1024 1.000000 1.000000 1.000000 1.000000 1.000000
1536 1.000000 1.000000 1.000000 1.000000 1.000000
2048 1.000000 1.000000 0.500000 1.000000 1.000000
EOD
set title "zack:r=0.2 (question before)"
plot $passkey12 matrix rowheaders columnheaders using 1:2:3 with image notitle, $passkey12 matrix rowheaders columnheaders using 1:2:(sprintf('%.2f',$3)) with labels notitle
$passkey13 << EOD
x 0 25 50 75 100
512 1.000000 1.000000 1.000000 1.000000 1.000000
1024 1.000000 1.000000 1.000000 1.000000 1.000000
1536 1.000000 1.000000 1.000000 1.000000 1.000000
2048 1.000000 1.000000 1.000000 1.000000 1.000000
EOD
set title "hack:bits=4 (question after)"
plot $passkey13 matrix rowheaders columnheaders using 1:2:3 with image notitle, $passkey13 matrix rowheaders columnheaders using 1:2:(sprintf('%.2f',$3)) with labels notitle
$passkey14 << EOD
x 0 25 50 75 100
512 1.000000 1.000000 1.000000 1.000000 1.000000
1024 1.000000 1.000000 1.000000 1.000000 1.000000
1536 1.000000 1.000000 1.000000 1.000000 1.000000
2048 1.000000 1.000000 1.000000 1.000000 1.000000
EOD
set title "hack:bits=4 (question before)"
plot $passkey14 matrix rowheaders columnheaders using 1:2:3 with image notitle, $passkey14 matrix rowheaders columnheaders using 1:2:(sprintf('%.2f',$3)) with labels notitle
$passkey15 << EOD
x 0 25 50 75 100
512 1.000000 1.000000 1.000000 1.000000 1.000000
1024 1.000000 1.000000 1.000000 1.000000 1.000000
1536 1.000000 1.000000 1.000000 1.000000 1.000000
2048 1.000000 1.000000 1.000000 1.000000 1.000000
EOD
set title "zack:r=0.02,align=4+hack:bits=4 (question after)"
plot $passkey15 matrix rowheaders columnheaders using 1:2:3 with image notitle, $passkey15 matrix rowheaders columnheaders using 1:2:(sprintf('%.2f',$3)) with labels notitle
$passkey16 << EOD
x 0 25 50 75 100
512 1.000000 1.000000 1.000000 1.000000 1.000000
1024 1.000000 1.000000 1.000000 1.000000 1.000000
1536 1.000000 1.000000 1.000000 1.000000 1.000000
2048 1.000000 1.000000 1.000000 1.000000 1.000000
EOD
set title "zack:r=0.02,align=4+hack:bits=4 (question before)"
plot $passkey16 matrix rowheaders columnheaders using 1:2:3 with image notitle, $passkey16 matrix rowheaders columnheaders using 1:2:(sprintf('%.2f',$3)) with labels notitle
$passkey17 << EOD
x 0 25 50 75 100
512 1.000000 1.000000 1.000000 1.000000 1.000000
1024 1.000000 1.000000 1.000000 1.000000 1.000000
1536 1.000000 1.000000 1.000000 1.000000 1.000000
2048 1.000000 1.000000 1.000000 1.000000 1.000000
EOD
set title "zack:r=0.05,align=4+hack:bits=4 (question after)"
plot $passkey17 matrix rowheaders columnheaders using 1:2:3 with image notitle, $passkey17 matrix rowheaders columnheaders using 1:2:(sprintf('%.2f',$3)) with labels notitle
$passkey18 << EOD
x 0 25 50 75 100
512 1.000000 1.000000 1.000000 1.000000 1.000000
1024 1.000000 1.000000 1.000000 1.000000 1.000000
1536 1.000000 1.000000 1.000000 1.000000 1.000000
2048 1.000000 1.000000 1.000000 1.000000 1.000000
EOD
set title "zack:r=0.05,align=4+hack:bits=4 (question before)"
plot $passkey18 matrix rowheaders columnheaders using 1:2:3 with image notitle, $passkey18 matrix rowheaders columnheaders using 1:2:(sprintf('%.2f',$3)) with labels notitle
unset multiplot
unset output

reset
set terminal pngcairo size 800,500
set termoption noenhanced
set output "tradeoff.png"
set title 'KV memory against quality'
$tradeoff << EOD
2112.000000 24.118166 "dense"
2018.671875 24.142331 "zack:r=0.01"
1943.906250 24.176695 "zack:r=0.02"
1772.203125 24.304427 "zack:r=0.05"
1563.890625 24.691059 "zack:r=0.1"
1252.453125 26.388203 "zack:r=0.2"
336.000000 24.176827 "hack:bits=4"
316.031250 24.229923 "zack:r=0.02,align=4+hack:bits=4"
291.000000 24.344469 "zack:r=0.05,align=4+hack:bits=4"
EOD
set xlabel 'KV bytes per token per layer'
set ylabel 'perplexity (decode path)'
set logscale xy
plot $tradeoff using 1:2 with points pt 7 notitle, $tradeoff using 1:2:3 with labels offset 0,1 font ',8' notitle
unset output
